"""Automatic placement: a short profile of the roles on this machine (:mod:`.profile`) and a
cost model that predicts what each placement would do (:mod:`.model`)."""
