"""thinkray storage: DuckDB persistence, one file per actor. The only package that imports duckdb."""
