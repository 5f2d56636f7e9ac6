"""Background duties: the scheduler leader's lock and the periodic work it runs (due-task
mover, reaper, idle-queue sweep, schedule firer, chain and group follow-ups).
"""
