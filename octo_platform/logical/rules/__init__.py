"""Rewrite rules of the logical plan: one module per rule, each a pure ``plan -> plan``
function named for what it does; ``octo_platform.logical.optimizer`` runs them in order."""
from __future__ import annotations

from octo_platform.logical.rules.bound_top_n import bound_top_n
from octo_platform.logical.rules.join_conditions import join_conditions
from octo_platform.logical.rules.prune_columns import prune_columns
from octo_platform.logical.rules.push_filters import push_filters

__all__ = ["bound_top_n", "push_filters", "join_conditions", "prune_columns"]
