"""A command whose extra is missing names the extra (the light install)."""

from ablab.cli import missing_extra


def test_missing_modules_map_to_their_extra():
    assert missing_extra(ModuleNotFoundError("x", name="torch")) == "inference"
    assert missing_extra(ModuleNotFoundError("x", name="pyflink.table")) == "stream"
    assert missing_extra(ModuleNotFoundError("x", name="chdb")) == "server"
    assert missing_extra(ModuleNotFoundError("x", name="streamlit")) == "dashboard"
    assert missing_extra(ModuleNotFoundError("x", name="ablab.platform.nothing")) is None
