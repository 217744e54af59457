"""The agent classes: Think (seed 000), Agent (Think + seed 002 capabilities), worker and persistent agents."""
