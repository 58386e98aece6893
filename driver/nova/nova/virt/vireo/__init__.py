"""vireo as Nova's virt driver: ``[DEFAULT] compute_driver = vireo.VireoDriver``."""

from nova.virt.vireo import driver

VireoDriver = driver.VireoDriver

__all__ = ['VireoDriver']
