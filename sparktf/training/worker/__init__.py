"""The worker's side of training: what runs inside a segment's barrier tasks.

``loop``: a segment's iterations in one barrier task (feed, step, heartbeat,
state hand-back), with the ``segment_spec`` the driver hands it; ``step``: one iteration as a traced step and an update
call; ``gradient_exchange``: how gradients travel between the ranks (dense,
row, compressed); ``step_clock``: the step's phases timed; ``failures``: what
a failed step is (which error, whether a relaunch helps); ``evaluation``: a
task's metric states; ``class_weights`` and ``single_pass``: how a batch is
weighted. Never imports the driver's side.
"""
