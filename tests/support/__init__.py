"""What the test modules share (no test module imports another; fixtures are in conftest.py).

    ggufgen.py          tiny GGUF files written with gguf-py's GGUFWriter (random weights)
    fake_vocab.py       a byte-level vocabulary for tokenizer-free tests
    scripted_model.py   a stand-in model whose next token the prompt scripts (scheduler tests)
    reference_model.py  the numpy float64 forward pass the engine is checked against
    refs.py             where llama.cpp's reference outputs live (tests/data/)
    model_files.py      the real model files, fetched once into the cache
    servers.py          the gateway served from a thread (Server) or a child process
    fakes.py            instant stand-ins for loaded models and their loaders
    batch_checks.py     batching expectations: the one-sequence path, near ties
    sse.py              reading server-sent events as a client does
    schemas.py          JSON Schemas for structured output
"""
