"""The rules of dtq's domain, as pure code: names and ids (:mod:`.names`), the
validation of a new task (:mod:`.validation`), schedule timetables (:mod:`.schedule_plan`)
and chain/group follow-up planning (:mod:`.followup_plan`).

A leaf below every layer: it imports nothing of ``store`` (nor of anything above it), so
the store and the layers above import it without a cycle. See docs/design.md, "Layers
and folders".
"""
