"""The control plane: REST API, auth, database, run launcher and the live dashboard.

`service.main.create_app(settings)` builds the FastAPI app; `tsrl serve` (service/cli_serve.py) runs
it with uvicorn. Runs are executed by the run driver (`tsrl train`) through the run-directory
contract in docs/CONTRACTS.md; the launcher (service/launcher/) supervises it and ingests its files.
"""
