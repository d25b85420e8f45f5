"""Durable state: Delta tables through delta-rs (the only package importing ``deltalake``)."""
