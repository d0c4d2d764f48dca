"""What a person sees and does, shared by the admin listener and the CLI:
`actions` (what may be done to events and deliveries), `views` and `glance`
(events and deliveries as JSON-ready values), `search` (by content), `resend`
(an edited body sent again), `inputs` (what a person typed, checked), and how
relay is watched: `metrics` (written out by `exposition`), `logs`, `systemd`."""
