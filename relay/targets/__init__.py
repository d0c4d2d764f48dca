"""Targets: where deliveries go. A type is one module here (its settings, the
target that sends, its `KIND`); relay.loader.registry lists them and builds
one for a config (`build_target`). What a target is: relay.kinds.target."""
