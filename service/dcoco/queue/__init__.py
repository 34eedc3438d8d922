"""The Redis Streams queue between gateways and workers."""
