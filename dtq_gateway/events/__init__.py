"""The events path: the one pub/sub subscription per gateway (hub), the filtered fan-out
to Subscribe streams and the wire format of the events messages.
"""
