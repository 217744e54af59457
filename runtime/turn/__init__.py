"""One turn: the agentic loop, folding chunks into a message, the recorder, run streams, model context."""
