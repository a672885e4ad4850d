# The two set-up commands (see README):
#   make train   install, then the default job: record 20 demonstrations of gym_hil's MuJoCo
#                Franka pick-cube with the block placed at random (the sim's scripted expert on a
#                simulated SpaceMouse), then train RLPD on them (state, this machine) until
#                evaluation success on 50 held-out block positions reaches 90%
#   make test    install, then run the test suite (what CI runs); robosuite's own environment and
#                LeRobot's dataset code (a test oracle) install beside the first tests
.PHONY: install train test bench

install:
	bash scripts/install.sh

DEMOS ?= runs/demos/pick-random-20

train: install
	test -f $(DEMOS)/meta/info.json || .venv/bin/rlinf-user teleop --sim gym_hil_random teleop=synthetic \
		dataset.root=$(DEMOS) dataset.episodes=20
	.venv/bin/rlinf-user train --sim gym_hil_random algo=rlpd demos=$(DEMOS) target_success=0.9 $(ARGS)

test: install
	bash scripts/run_tests.sh $(PYTEST_ARGS)

bench: install
	.venv/bin/python benchmarks/run_all.py
