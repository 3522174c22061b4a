"""teacher"""
