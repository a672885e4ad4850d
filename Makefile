# The two set-up commands (see README):
#   make train   install, then train the default job (gym_hil MuJoCo Franka pick-cube, state, SAC,
#                this machine) until evaluation success reaches 90%
#   make test    install (plus robosuite's own environment and LeRobot's dataset code as a test
#                oracle), then run the test suite (what CI runs)
.PHONY: install train test bench

install:
	bash scripts/install.sh

train: install
	.venv/bin/rlinf-user train target_success=0.9 $(ARGS)

test: install
	bash scripts/install_robosuite_env.sh
	bash scripts/install_lerobot_env.sh
	bash scripts/run_tests.sh $(PYTEST_ARGS)

bench: install
	.venv/bin/python benchmarks/run_all.py
