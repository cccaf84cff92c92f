"""The local engine as a generation backend: the served model, its scheduler thread."""
