"""Delivery: the scheduler leases what is due, sends it through its target,
records the attempt and decides what follows (`retry`: the policy as pure
functions), paced by `ratelimit`."""
