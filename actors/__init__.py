"""thinkray actors: the Ray layer (session actors, namespace, orchestrator, CLI). The only package that imports ray."""
