"""Edges of the data flow: sources that decode input into weighted rows, sinks that encode
weighted rows as Debezium change events, and data generators for demos and benchmarks."""
