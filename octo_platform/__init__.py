"""octo-platform: streaming SQL compiled to incremental, retraction-aware Spark jobs that
write Debezium-style changelogs to Delta Lake, exactly once."""

__version__ = "0.1.0"
