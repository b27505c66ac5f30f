"""A keyed topic's names and bounds, as plain constants and one pure function: what the CLI's
parser shows (``ordq topic create --help``) and ``ordq topic list`` prints, without loading the
topic's config class (``coordinator.topics.TopicConfig``, attrs) or the queue state (issue 42:
``ordq topic list`` imported both, 362 M instructions against ``queue list``'s 253 M).
``coordinator/topics.py`` holds the rest and re-exports these.

Rules: constants and string functions only; no imports.
"""

MAX_PARTITIONS = 256
HASH_NAME = "blake2b-64-mod"  # recorded with the topic, so a future hash cannot be mixed in silently
PARTITION_SEPARATOR = ".p"
MAX_TOPIC_NAME = 120  # room for ".p255" within the 128-character queue name


def partition_queue(topic: str, partition: int) -> str:
    """The queue that holds partition ``partition`` of ``topic``."""
    return f"{topic}{PARTITION_SEPARATOR}{partition}"


# What a re-key (``ordq topic alter T --partitions M --rekey``) leaves of the order guarantee.
REKEY_NOTE = (
    "keys now route among the new partition count: a key whose partition changed has its earlier messages in "
    "its old partition and its later ones in the new one, so its order holds among the messages sent before "
    "the re-key and among those sent after, but not across it unless consumers finish the old partition's "
    "backlog first; producers that still route with the old count must be restarted (a TopicProducer stops "
    "sending when it sees the change)"
)
