"""Elastic jobs (the launcher's side): host discovery, the driver that forms each world, and the
channel between the driver and its workers.

Modules:
  discovery  the discovery script, hosts' blacklist and cooldown
  driver     worlds (rounds): who takes part, which rank, when to give up
  service    the driver's HTTP endpoints (ready for the next world, notifications)
  launch     ``tfhvdrun --host-discovery-script ...``: processes and output

The worker's side of the channel is :mod:`tfhvd.common.elastic_worker`: a
training process imports nothing from the launcher.
"""
