"""The ground of ordq: what every layer above may import."""
