"""Model adapters: the Model seam, the Anthropic adapter, and test models (ScriptedModel, FunctionModel)."""
