"""Real database servers (Debian's MariaDB and PostgreSQL) started in temp folders, for the CDC
drill, the CDC demo, tests and benchmarks."""
