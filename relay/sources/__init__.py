"""Sources: one module a sender (relay/sources/<name>.py), each holding its
settings, the profile that verifies its requests, names its events and
answers it, and its `KIND`; relay.loader.registry lists them. What a profile
decides is a value (relay.kinds.source); what they share is relay.sources.base."""
