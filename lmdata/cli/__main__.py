from lmdata.cli.main import main

main()
