"""Replicas: container processes (`amity serve`) the Suite starts, supervises and routes to."""
