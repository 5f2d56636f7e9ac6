"""Leasing: Lease sessions, the dispatcher that hands tasks to them, completion of
leases (Ack/Nack/Heartbeat) and the signed lease ids that fence them.
"""
