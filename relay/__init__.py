"""relay: acknowledge webhooks fast, keep them on disk, deliver them until confirmed."""

__version__ = "0.1.0"
