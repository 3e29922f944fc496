"""Knowledge bases: ingestion (an amity extension) and the spec's retrieve."""
