"""The operator commands' logic (`pgsched jobs`, `history`, `status`, ...): `query` reads and
acts through the public views and API functions (so row-level security decides what a person
sees and may do), `health` judges what `status` read, `render` draws tables or JSON, and
`watch` follows pgsched_events. pgsched/commands.py only parses options and calls these."""
