"""The ML core, torch only: targets, drafters, hidden states, training, the reference engine, formats."""
