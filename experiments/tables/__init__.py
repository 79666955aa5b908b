"""One module per reproduced paper table: its arms and claims, declared before it runs."""
