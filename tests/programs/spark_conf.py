"""The Spark settings of the test programs' own sessions (loopback only, no UI)."""

CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.default.parallelism": "2",
    "spark.python.daemon.module": "sparktf.spark.tf_daemon",  # workers fork with TensorFlow loaded
}
