"""The HTTP surface, one module per API: OpenAI's, llama.cpp's, the operators', the web console."""
