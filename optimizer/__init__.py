"""kvtune's optimizer: workload specs, the search, recommendations, reports and the CLI.

Builds on ``costmodel``; only ``optimizer.cli`` imports click.
"""
