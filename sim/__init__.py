"""Discrete-event (simpy) models of the draft/verify loop and of serving.

Every duration comes from ``perfmodel``; acceptance is iid, positional, tree-shaped or replayed
from engine traces (issue #5).
"""
