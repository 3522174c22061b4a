PY := .venv/bin/python
export PYTHONHASHSEED := 0

.PHONY: setup test run lint format bench-equivalence clean

setup:
	@bash scripts/setup.sh

test: setup
	bash scripts/test.sh

run: setup
	bash scripts/run.sh

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy -p thundersync

format: setup
	.venv/bin/ruff check --fix .
	.venv/bin/ruff format .

clean:
	rm -rf .venv build *.egg-info .pytest_cache .mypy_cache .ruff_cache
