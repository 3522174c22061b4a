"""ThunderSync on SkyRL: SkyRL's registries, environments and trainer seams, ThunderSync's exact
streaming learner behind them.

Importing this package prepares the interpreter for skyrl (`compat`); every module here imports
skyrl only after that, so `import thundersync.skyrl.<module>` is always safe on Python 3.11.
"""

from thundersync.skyrl.compat import prepare

prepare()
