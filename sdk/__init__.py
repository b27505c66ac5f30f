"""ordq client SDK: ordered producer and consumer, audit hook."""
