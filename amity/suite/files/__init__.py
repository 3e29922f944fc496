"""Files: the object stores and the Files API (`/beta/file...`)."""
