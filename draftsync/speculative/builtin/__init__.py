"""The demo's built-in tiny targets: their recipes, their tokenizer, and the copies that ship with draftsync."""
