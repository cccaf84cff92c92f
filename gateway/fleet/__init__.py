"""The models' lives: the registry, eviction, lifecycle, config reloads."""
