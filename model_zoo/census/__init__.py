"""Wide & deep on the UCI Adult census income data."""
