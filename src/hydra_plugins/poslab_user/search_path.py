"""Hydra finds a researcher's own configs (POSLAB_USER, poslab/user.py): each folder's conf/ joins
the search path after poslab's own, so `pos=mine` composes conf/pos/mine.yaml from there."""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class PoslabUserSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from poslab.errors import ConfigError
        from poslab.user import activate

        try:
            folders = activate()
        except ConfigError:
            return  # the registry reports it in one line when the app starts (run/cli.py)
        for folder in folders:
            search_path.append(provider="poslab-user", path=f"file://{folder / 'conf'}")
