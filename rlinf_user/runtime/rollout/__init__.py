"""An env worker's rollout as a pipeline of stages, each in its own module:

observation (:mod:`.observe`: the learner's layout, frame features) -> act (:mod:`.act`:
local or served policy, action chunks, chunks run at the edge) -> step hooks
(:mod:`.hooks`: a person's takeover, a learned reward, GRPO's group holds) -> transition
writer (:mod:`.writer`: ``Col`` columns, on-policy decision rows, numbered chunks to the
sink) -> episode bookkeeping (:mod:`.episodes`). A step travels through them as a
:class:`~.step.Step`.
"""
