"""The Suite: the platform around containers (`amity suite`). See shared/design/suite.md."""
