"""A queue's settings' defaults and bounds, as plain constants: what the CLI's parser shows
(``ordq queue create --help``) without loading the settings' class (``store_values.QueueConfig``,
attrs) or the queue state's (issue 42: ``ordq queue list`` builds that parser too).

Rules: constants only, no imports.
"""

DEFAULT_MAX_MESSAGE_BYTES = 1 << 20
DEFAULT_SEGMENT_BYTES = 256 << 20
DEFAULT_SEGMENT_AGE_S = 3600.0
MIN_SEGMENT_BYTES = 4 << 10
ROLL_TO = ("same", "next")  # where a roll opens the next segment: the same head, or the next group
