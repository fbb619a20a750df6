"""The test suite, one folder per level (tests/levels.py), every test marked with its folder's name by conftest.py:
unit/ (fast, in-process), e2e/grpc, e2e/http, e2e/kserve (server processes, by door), reliability/, training/,
export/, pipeline/, harness/. The helpers every folder shares live here and import one way,
`from tests.<module> import ...`: server_process (a real server), door_calls (HTTP and KServe calls), pair_models,
hf_models, scheduler_plans, training_runs; conftest.py holds the tiny models' session fixtures and builders."""
