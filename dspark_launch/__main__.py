from dspark_launch.cli.main import app

app(prog_name="dspark")
