"""User commands: publish/subscribe clients, accounts and development certificates."""
