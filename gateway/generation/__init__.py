"""The generation core: requests and events, planning, structured output, tool calls."""
