"""Elastic jobs: host discovery, the driver that forms each world, and the
channel between the driver and its workers.

Modules:
  discovery  the discovery script, hosts' blacklist and cooldown
  driver     worlds (rounds): who takes part, which rank, when to give up
  service    the driver's HTTP endpoints (ready for the next world, notifications)
  worker     the worker's side of that channel
  launch     ``tfhvdrun --host-discovery-script ...``: processes and output
"""
