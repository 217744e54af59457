"""Durable services of an agent: fibers and schedules (rows in its database, resumed on wake)."""
